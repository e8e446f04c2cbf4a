"""treadle.lang"""
