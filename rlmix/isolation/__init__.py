"""Running untrusted code: bubblewrap isolation (``bwrap``) and limited, capped child processes.

Shared by the agentic ``local`` runtime and the ``python_tests`` reward; imports nothing of rlmix.
"""
