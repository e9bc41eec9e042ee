"""The Python client of the bai API."""

from bai.client.api import APIError, Client, ExecStream

__all__ = ["APIError", "Client", "ExecStream"]
