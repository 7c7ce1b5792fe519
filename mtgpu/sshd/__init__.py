"""sshd"""
