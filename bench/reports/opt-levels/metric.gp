# written by mixprec; re-plot with: cd 'bench/reports/opt-levels' && gnuplot 'metric.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'metric.png'
set title 'test accuracy'
set xlabel 'epoch'
set ylabel 'accuracy (%)'
set grid
set datafile missing '?'
set key top right
plot 'metric.dat' index 0 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'fp32', \
     'metric.dat' index 1 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'bf16 O1', \
     'metric.dat' index 2 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'bf16 O2', \
     'metric.dat' index 3 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'bf16 O3', \
     'metric.dat' index 4 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'fp16 O1', \
     'metric.dat' index 5 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'fp16 O2', \
     'metric.dat' index 6 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'fp16 O3'
