"""The pure job table the in-process stores share, and ``TableStore``, the Store protocol over it."""
