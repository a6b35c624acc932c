"""Sans-I/O wire formats: request inspection, usage parsing, SSE framing and protocol translators."""
