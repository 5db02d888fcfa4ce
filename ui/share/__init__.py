"""Sharing a reply's decoding: the self-contained replay page, the animated GIF, and Teach's Share
buttons that write them."""
