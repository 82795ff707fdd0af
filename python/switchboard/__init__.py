"""Switchboard from Python: `import switchboard.torch_rpc` registers the
SWITCHBOARD backend of torch.distributed.rpc (docs/torch_rpc.md)."""

# The package's version, which the wheel carries (python/make_wheel.py).
__version__ = "0.1.0"
