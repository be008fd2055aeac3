"""PySpark entry points: the consistent parallel snapshot and the apply job (see DESIGN.md).

Each module is a thin ``main()`` over the shared skeleton :mod:`lakeslot.control.jobs` and the job's
``run`` in the library; the library never imports these modules (local mode calls the jobs'
``run`` itself)."""
