"""Rolling-summary logic that needs no model: prompt, validation, the offline summarizer."""
