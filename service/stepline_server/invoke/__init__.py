"""invoke"""
