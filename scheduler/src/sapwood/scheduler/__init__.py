"""sapwood.scheduler"""
