"""Backends run the networks for the engine: TensorRT plans or PyTorch modules, one interface."""
