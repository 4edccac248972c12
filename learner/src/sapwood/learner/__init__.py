"""sapwood.learner"""
