"""bai: compute sessions in containers, in one program."""

__version__ = "0.1.0"
API_VERSION = "v7.20230615"
