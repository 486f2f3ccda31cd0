//! The alarm wheel over expiries.
