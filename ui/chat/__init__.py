"""The Chat and Complete tabs: a reply as it streams, its token view and stats strip, its charts, the
model header and the settings that shape a reply."""
