"""Framework adapters: `import perseus.adapters.<framework>` patches that framework."""
