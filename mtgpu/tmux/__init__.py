"""tmux"""
