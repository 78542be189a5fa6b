"""Mining: walk an expert kernel backward through the gate and extract skills from the walk."""
