"""sapwood.platform"""
