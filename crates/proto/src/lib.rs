//! fastcp-proto.
