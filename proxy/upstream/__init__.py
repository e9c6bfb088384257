"""Everything that talks to model servers: the HTTP client, the runner of one upstream
request, passthrough, the dialect probe and the tokenizer worker."""
