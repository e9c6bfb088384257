"""Everything that talks to model servers: the HTTP client and its concurrency gate
(`client`), the pool of replicas and which one a request goes to (`pool`), the runner of one
upstream request (`runner`), passthrough of every other `/v1/*` request (`passthrough`), the
dialect probe (`probe`), the tokenizer worker (`tokenizer`) and the moderation hook of the
input guards (`moderation`)."""
