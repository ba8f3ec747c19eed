"""seccomp"""
