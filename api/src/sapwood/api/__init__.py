"""sapwood.api"""
