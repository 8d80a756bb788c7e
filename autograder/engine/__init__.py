"""The grading engine: grades nbgrader's submitted/ tree fast and with student code isolated.

Trusted side (the grader's process): discover -> prepare -> pool -> results -> writer
-> report, driven by grade. Untrusted side (sandboxed workers): zygote forks a child
per notebook; child confines itself (confine, landlock) and runs cells (kernel).
protocol is the only way the two talk: JSON and bytes, never pickle.
"""
