"""``/v1/files``: uploads and batch outputs, bytes in the object store, rows in SQL."""
