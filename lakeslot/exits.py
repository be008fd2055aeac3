"""Exit codes, one scheme for every lakeslot process: ``lakeslot run``, the reader, the Spark jobs
and the command line.

- 0 (:data:`EXIT_OK`): stopped when asked, caught up, or done.
- 1 (:data:`EXIT_FAILED`): failed; retrying later may help (connection lost, Spark failed).
- 2 (:data:`EXIT_USAGE`): bad input (arguments, files, missing secrets); nothing was started.
- 3 (:data:`EXIT_DEFINITE`): a definite error that needs a human; the message and ``lakeslot
  status`` say what to do (DESIGN.md invariant 7).

Supervisors (local mode, Kubernetes restart policies) rely on it: 3 is never retried blindly.
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DEFINITE = 0, 1, 2, 3
