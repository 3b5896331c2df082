"""Speech and transcription: request rules, one metered head call, the answer."""
