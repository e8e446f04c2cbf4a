"""treadle.runtime.server"""
