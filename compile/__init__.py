"""Offline compilation: export the networks to ONNX and build TensorRT plans for the GPU that runs them."""
