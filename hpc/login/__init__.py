"""The login side: site profiles, job specs, the rendered sbatch script, submission, jobs, planning, preflight."""
