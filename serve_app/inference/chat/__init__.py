"""Chat and legacy completions: translation, the text service, answers, the server-tool loop."""
