"""The sandbox student code runs in: bubblewrap namespaces, Landlock, resource limits, and what
the sandbox lets a worker see."""
