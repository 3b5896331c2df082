"""Video generation jobs: submit, poll, cancel (job records and store: ``serve_app.jobs``)."""
