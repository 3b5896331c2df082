"""Control: the reconciler and the Serve backends it converges to the stored endpoints."""
