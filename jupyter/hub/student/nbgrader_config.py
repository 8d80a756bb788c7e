"""nbgrader for every student's server on a JupyterHub (this folder goes to the servers'
/etc/jupyter: README, "Running the course on a JupyterHub").

The Assignment List fetches and submits through the exchange, a folder every server sees
(one machine: The Littlest JupyterHub; a shared volume: zero-to-jupyterhub). A student is
their hub login name, on TLJH (whose Unix users are named jupyter-NAME) as on
zero-to-jupyterhub (where everyone is the Unix user jovyan).
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.course_id = "autograd-course"
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")
if os.environ.get("JUPYTERHUB_USER"):
    c.CourseDirectory.student_id = os.environ["JUPYTERHUB_USER"]
