"""gpuinfo"""
