"""treadle.runtime.models"""
