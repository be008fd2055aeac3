"""The lakeslot control plane (kopf). Lives in the folder ``operator/`` under this name because
``operator`` is a Python standard-library module."""
