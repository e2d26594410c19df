"""
The inputs of a run: the test images and how a file becomes the canonical image
(`images`), the paper's downloads (`fetch`), and the embedded demo's assets built from
seeds (`demo`).
"""
