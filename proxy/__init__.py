"""wsmode: the Responses API's WebSocket mode in front of stateless HTTP model servers."""

__version__ = "0.1.0"
