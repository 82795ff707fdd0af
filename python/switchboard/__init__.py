"""Switchboard from Python: `import switchboard.torch_rpc` registers the
SWITCHBOARD backend of torch.distributed.rpc (docs/torch_rpc.md)."""
