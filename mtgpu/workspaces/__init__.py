"""workspaces"""
