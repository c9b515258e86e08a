"""Policy checks that stand between a plan and the clouds.

SpotPolicy rules shape the solver's choices (the problem package and the solve package);
GuardrailPolicy rules are checked here once more against the finished plan, so
a saved plan or a solver bug can never carry a forbidden change to a provider."""
