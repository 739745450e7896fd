"""What a pipeline run reports: the side-by-side tables of its training runs (summary), their charts and
the one-page report.html (page), retrieval's tables, the timeline of the steps, and the pictures of a
store's boxes (cache_show, also `vlbert cache show`)."""
