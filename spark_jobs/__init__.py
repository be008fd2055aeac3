"""PySpark entry points: the consistent parallel snapshot and the apply job (see DESIGN.md)."""
