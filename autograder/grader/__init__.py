"""The grading engine: the trusted side, where every verdict is decided (never visible to student code)."""
