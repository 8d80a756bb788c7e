"""The grading engine behind `autograder grade`: nbgrader's autograde step, fast and isolated.

Trusted side, the grader's one process: grade (start workers) -> course (the steps) ->
discover -> prepare -> pool -> results -> writer (gradebook via gradebook, one transaction
per submission) -> report; feedback and speedups wrap nbgrader's own code.
Untrusted side, in the sandbox (sandbox, limits): zygote, a warm worker, forks a child
per notebook; child confines itself (confine, landlock) and runs cells (kernel).
protocol is the only way the two sides talk: JSON and raw bytes, never pickle.
"""
