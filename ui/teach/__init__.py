"""The Teach tab: a stored reply replayed block by block, compared with plain decoding, and a
session's analytics."""
