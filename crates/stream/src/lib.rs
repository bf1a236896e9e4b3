//! fastcp-stream.
