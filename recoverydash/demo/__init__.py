"""The `make demo` package: a real fault-injected PyTorch run watched by recoverydash (see
__main__)."""
