"""wrapper"""
