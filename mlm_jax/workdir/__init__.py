"""workdir"""
