"""sapwood.rollout"""
