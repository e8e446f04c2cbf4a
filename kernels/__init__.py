"""treadle.kernels"""
