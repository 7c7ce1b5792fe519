"""schedd"""
