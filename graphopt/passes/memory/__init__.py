"""Static memory planning: lifetimes over a schedule, arena offsets, in-place reuse, ordering."""
