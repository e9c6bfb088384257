"""The plain HTTP front: `POST /v1/responses`, the stored-response routes and
`POST /v1/responses/compact`."""
